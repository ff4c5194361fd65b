"""Holds nbox's ``sitecustomize.py``: the launcher puts this folder (not its parent) on ``PYTHONPATH``.

A package only so that the file ships with an installed nbox; nothing imports it as
``nbox_record._inject``.
"""
