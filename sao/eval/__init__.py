"""Evaluation, a user feature: `sao eval swebench` (official predictions, graded by the swebench harness) and
`sao eval math`, their one scorer (``scores``) and reports. Sits between the agent and the trainer: a staged run's
eval stages call it, and it never imports the trainer."""
