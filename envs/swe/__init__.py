"""SWE-bench-style software-engineering environment (``SWEEnv``), its grader, and the offline task builder."""
