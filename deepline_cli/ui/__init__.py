"""What people see: the live view, NDJSON, the verdict, logs, `runs show` and the HTML report.
Reads events and the store; runs nothing."""

__all__ = ["console", "logs", "ndjson", "report_data", "report_html", "run_show", "state", "text", "verdict"]
