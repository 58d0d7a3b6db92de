"""A fleet of boards over Apache TVM's RPC tracker, and MetaSchedule tuning records per target.

`device` and `server` run on the board (standard library, numpy, edgedyn.runtime and TVM's RPC; Python 3.8 syntax);
`client` and `tuning` run on the host; `database` locates the tuning records the TVM backend builds with.
See docs/fleet.md.
"""
