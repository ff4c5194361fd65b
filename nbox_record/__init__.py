"""nbox_record: launcher, capture and conversion to Chakra ET.

Empty for now: ``nbox record`` does not exist yet (the record issue builds it). It never imports
``nbox_replay``.
"""
