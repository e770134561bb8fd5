"""The alert rules as the Prometheus page (docs/guides/metrics.md) shows them, checked and
unit-tested by promtool (Prometheus's own rule tester) on series shaped like the
metrics' (two workers reporting the same cluster figures)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from ..support.tools import program

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "metrics.md").read_text()
(RULES,) = re.findall(r"```yaml\n(groups:.*?)```", PAGE, re.DOTALL)

UNIT_TESTS = """
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # digest, every minute: succeeds until 10m (last success 600), then fails.
      - series: 'fastapi_jobs_last_success_timestamp_seconds{job_name="digest",instance="w1"}'
        values: '0+60x10 600x120'
      - series: 'fastapi_jobs_last_success_timestamp_seconds{job_name="digest",instance="w2"}'
        values: '0+60x10 600x120'
      - series: 'fastapi_jobs_interval_seconds{job_name="digest",instance="w1"}'
        values: '60x130'
      - series: 'fastapi_jobs_interval_seconds{job_name="digest",instance="w2"}'
        values: '60x130'
      - series: 'fastapi_jobs_paused{job_name="digest",instance="w1"}'
        values: '0x130'
      # fine: succeeds every minute throughout.
      - series: 'fastapi_jobs_last_success_timestamp_seconds{job_name="fine",instance="w1"}'
        values: '0+60x130'
      - series: 'fastapi_jobs_interval_seconds{job_name="fine",instance="w1"}'
        values: '60x130'
      # held: paused by an operator; its last success is old, and that is expected.
      - series: 'fastapi_jobs_last_success_timestamp_seconds{job_name="held",instance="w1"}'
        values: '0x130'
      - series: 'fastapi_jobs_interval_seconds{job_name="held",instance="w1"}'
        values: '60x130'
      - series: 'fastapi_jobs_paused{job_name="held",instance="w1"}'
        values: '1x130'
      # never_ok: ran, never succeeded (0).
      - series: 'fastapi_jobs_last_success_timestamp_seconds{job_name="never_ok",instance="w1"}'
        values: '0x130'
      - series: 'fastapi_jobs_interval_seconds{job_name="never_ok",instance="w1"}'
        values: '3600x130'
      # The store answers until 10m, then not.
      - series: 'fastapi_jobs_store_up{instance="w1"}'
        values: '1x10 0x120'
      - series: 'fastapi_jobs_store_up{instance="w2"}'
        values: '1x10 0x120'
    alert_rule_test:
      - eval_time: 12m  # 720 - 600 = 120: not more than two intervals yet
        alertname: JobNotSucceeding
        exp_alerts: []
      - eval_time: 14m  # over since 13m, for 1m
        alertname: JobNotSucceeding
        exp_alerts:
          - exp_labels: {severity: page, job_name: digest}
            exp_annotations:
              summary: "job digest has not succeeded for two intervals"
      - eval_time: 123m
        alertname: JobNotSucceeding
        exp_alerts:
          - exp_labels: {severity: page, job_name: digest}
            exp_annotations:
              summary: "job digest has not succeeded for two intervals"
          - exp_labels: {severity: page, job_name: never_ok}
            exp_annotations:
              summary: "job never_ok has not succeeded for two intervals"
      - eval_time: 14m
        alertname: JobStoreDown
        exp_alerts: []
      - eval_time: 17m
        alertname: JobStoreDown
        exp_alerts:
          - exp_labels: {severity: page}
            exp_annotations:
              summary: "fastapi_jobs cannot reach its store"
"""


def promtool() -> str:
    return program("promtool", "apt-get install prometheus")


def test_the_readmes_alert_rules_fire_when_they_should(tmp_path: Path) -> None:
    tool = promtool()
    (tmp_path / "rules.yml").write_text(RULES)
    (tmp_path / "tests.yml").write_text(UNIT_TESTS)
    checked = subprocess.run(
        [tool, "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [tool, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
