"""Elastic training, framework-neutral: the state that survives a change of
world (:mod:`.state`), where committed state is kept (:mod:`.store`), and the
``run`` wrapper that restores it when a world starts (:mod:`.run`).

hora re-forms a world by relaunching every rank under ``horarun`` (MPI
cannot take a new rank into a running job portably); what crosses the
relaunch is the last ``commit()``, which each host keeps on local disk.
``docs/elastic.md`` describes the whole mechanism.
"""

from hora.common.elastic.run import run
from hora.common.elastic.state import ObjectState, State

__all__ = ["ObjectState", "State", "run"]
