"""The stages of one target, in order: `check` (load, plan, probes, dry run, rules, findings),
`budget` (KV sizing per engine and mode) and `triage` (a log against the catalog)."""
