"""The super-resolution demo that `tapeworks demo` runs."""
