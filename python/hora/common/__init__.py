"""Framework-independent pieces shared by every hora adapter."""
