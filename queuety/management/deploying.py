"""``manage.py queuety deploy-check [--json]``: will every live run get past the code at hand?
Thin over ``queuety.deploy_check``; exits 1 when one would not."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from queuety import deploy_check as checking
from queuety.management.starting import Error


def add_deploy_check(groups: Any) -> None:
    """Add the ``deploy-check`` group to the command's sub-parsers."""
    parser = groups.add_parser(
        "deploy-check", help="Import every handler the definitions with live runs name, as a "
                             "worker would (through the handler aliases), and check each still "
                             "fits its step; exit 1 when a live run would fail.")
    parser.add_argument("--json", action="store_true",
                        help="Print the report as one JSON document.")


def deploy_check(options: dict[str, Any], write: Callable[[str], None]) -> None:
    """Run the check and print its report.

    Raises:
        Error: a live run would fail, or an alias leads nowhere (exit status 1, after the
            report).
    """
    report = checking.deploy_check()
    if options["json"]:
        write(json.dumps(report.to_dict(), indent=4, ensure_ascii=False))
    else:
        for line in report_lines(report):
            write(line)
    if not report.ok:
        raise Error(f"The deploy check found {report.failures} problem"
                    f"{'s' if report.failures != 1 else ''}: live runs would fail on this "
                    "code (see the report above).")


def report_lines(report: checking.DeployReport) -> list[str]:
    """The text report: a block per definition with live runs, then the aliases."""
    lines: list[str] = []
    for found in report.definitions:
        runs = ", ".join(f"{count} {status}" for status, count in found.live.items())
        lines += [f"{found.name}{' ' + found.version if found.version else ''}  definition "
                  f"{found.hash[:12]} (id {found.id})  {'ok' if found.ok else 'FAILS'}",
                  f"  live runs: {runs}; the oldest #{found.oldest_run_id}, created "
                  f"{found.oldest_created_at.isoformat(timespec='seconds')}"]
        lines += [f"  FAIL  {problem}" for problem in found.check.failures]
        lines += [f"  alias {f.ref.where} names {f.ref.path!r}, imported from {f.target!r}"
                  for f in found.check.aliased if f.ok]
    if report.aliases:
        lines.append("Handler aliases:")
        lines += [f"  {a.old} -> {a.new} ({a.source}): " + ("ok" if a.problem is None
                                                           else f"FAIL  {a.problem}")
                  for a in report.aliases]
    live = sum(sum(d.live.values()) for d in report.definitions)
    lines.append(f"Checked {len(report.definitions)} definition"
                 f"{'s' if len(report.definitions) != 1 else ''} with {live} live run"
                 f"{'s' if live != 1 else ''}: "
                 + ("no run would fail." if report.ok else
                    f"{report.failures} problem{'s' if report.failures != 1 else ''}."))
    return lines
