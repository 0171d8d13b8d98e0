"""``slotless airflow-triggerer``: the slotless engine serving an Airflow deployment's triggers.

It replaces ``airflow triggerer`` beside an Airflow 3 scheduler. Airflow's metadata database
stays Airflow's: this package reads and writes it only through Airflow's own triggerer
interfaces (``Job`` heartbeats, ``Trigger.assign_unassigned``, ``ids_for_triggerer``,
``bulk_fetch``, ``submit_event``, ``submit_failure``, ``clean_unused``), always in a thread,
never on the event loop. Airflow is imported only here, lazily, where it is installed.

- :mod:`.boot`: the Airflow version and the database's migration are checked at start.
- :mod:`.rows`: the blocking calls into Airflow's models.
- :mod:`.plans`: trigger rows equal in what they wait for become one check; which classes
  run natively.
- :mod:`.native`: the native checks (a file's glob, a moment).
- :mod:`.owners`: which of several live instances checks a condition.
- :mod:`.engine`: the loop: assignment, the checks, submitting what they found.
- :mod:`.comms`: the Task SDK's calls to Airflow's triggerer supervisor, answered here.
- :mod:`.service`: the command: start-up checks, signals, metrics.

See docs/airflow-triggerer.md.
"""
