"""Class-incremental learning (the paper's appendix "Class Incremental Learning"): data, learners, commands."""
