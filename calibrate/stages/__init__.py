"""Stage logic, testable without a terminal: each stage takes a ``StageContext``."""
