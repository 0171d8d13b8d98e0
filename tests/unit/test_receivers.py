"""The local receivers themselves: apprise's json:// and mailto:// reach them."""

from __future__ import annotations

from datetime import date

from support.receivers import HttpReceiver, SmtpReceiver, mail_text

from executor.notifications import CallbackContext, send


def _ctx() -> CallbackContext:
    return CallbackContext(
        event="on_failure", dag_id="d", run_id="r1", logical_date=date(2026, 1, 2),
        task_id="t", attempt=3, error="boom", log_tail=["a line"], context={},
    )  # fmt: skip


def test_json_notification_is_recorded(http_receiver: HttpReceiver) -> None:
    send(http_receiver.json_url("hook"), _ctx(), timeout=10)
    [got] = http_receiver.wait_for(1, timeout=10)
    assert got.path == "/hook"
    assert got.json["title"] == "slotless: d.t failure"
    assert "boom" in got.json["message"] and "a line" in got.json["message"]


def test_mail_notification_is_received(smtp_receiver: SmtpReceiver) -> None:
    send(smtp_receiver.mailto_url("ops@example.com"), _ctx(), timeout=10)
    [mail] = smtp_receiver.wait_for(1, timeout=10)
    assert mail["To"] == "ops@example.com"
    assert "slotless: d.t failure" in mail_text(mail) and "boom" in mail_text(mail)
