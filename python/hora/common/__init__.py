"""Framework-independent pieces shared by every hora adapter: the runtime
(``basics``), the NumPy face (``ops``), argument checks (``arguments``), how
gradients are combined (``gradient_policy``) and, in the private
``_adapter`` package, the naming, handles and core submission that the
NumPy face and every adapter use alike."""
