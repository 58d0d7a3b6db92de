"""A fleet of boards over Apache TVM's RPC tracker, and MetaSchedule tuning records per target.

`device` and `server` run on the board (standard library, numpy, edgedyn.runtime and TVM's RPC; Python 3.8 syntax);
`client` and `tuning` run on the host; the records `tuning` writes are located by edgedyn/backends/tuning_records.py,
beside the TVM backend that builds with them.
See docs/fleet.md.
"""
