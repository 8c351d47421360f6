"""``plugrl-report``: figures and an HTML page from a run folder (extra ``report``: matplotlib).

Importing this package stays light: matplotlib is imported only when the first figure is drawn.
"""

from plugrl_env_client.report.build import Report, build_report
from plugrl_env_client.report.data import RunData, load_run

__all__ = ["Report", "RunData", "build_report", "load_run"]
