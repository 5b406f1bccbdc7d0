"""hora's loader finds the PyPI Open MPI's library when the core's run path
does not: the real shared library, not the wheel's linker-script stand-in
for the unversioned name."""
from hora import _loader


def test_the_shared_library_is_chosen_over_a_linker_script(tmp_path):
    script = tmp_path / "libmpi.so"
    script.write_text("INPUT(libmpi.so.40)\n")
    library = tmp_path / "libmpi.so.40"
    library.write_bytes(b"\x7fELF" + bytes(60))
    missing = tmp_path / "libmpi.so.41"
    assert _loader._shared_library([str(script), str(missing), str(library)]) == str(library)
    assert _loader._shared_library([str(script)]) is None
