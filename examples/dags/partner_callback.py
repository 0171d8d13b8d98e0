"""A pipeline that waits for a partner's callback: an event, pushed, never polled.

The partner's system calls back when its export is ready (or you play the partner):

    slotless events send export.ready --payload '{"partner": "acme", "date": "2026-11-24",
                                                  "url": "s3://acme/exports/2026-11-24.csv"}'

or over HTTP, with the token `slotless up --token acme:SECRET` (or `slotless ui`) was given:

    curl -X POST http://127.0.0.1:8080/api/v1/events -H 'Authorization: Bearer SECRET' \\
         --json '{"name": "export.ready", "payload": {"partner": "acme", "date": "2026-11-24"}}'

The event's sender ends the wait in its own transaction (no triggerer needed for it; the
triggerer only holds the 12 h timeout). A callback that arrives before the run reaches the
sensor counts too: by default a wait sees every matching event since its run started.
"""

from executor import DAG
from triggers.events import EventTrigger

dag = DAG("partner_callback", schedule="@daily", catchup=False)

export_ready = dag.sensor(
    "export_ready",
    EventTrigger(name="export.ready", match={"partner": "acme", "date": "{{ ds }}"}),
    timeout="12h",
)


@dag.task(parents=[export_ready])
def load_export(ctx):
    callback = ctx.inputs["export_ready"]  # the event's payload is the sensor's output
    ctx.log(f"loading {callback.get('url', '(no url given)')} for {callback['partner']}")
    return {"loaded": callback.get("url")}
