"""The composition layer: the ``slotless`` command, ``slotless up`` and the web page.

It stands above the three packages it puts together (``triggers`` <- ``executor`` <-
``triggerer``) and nothing below imports it (import-linter checks the layers in
``make test``).
"""
