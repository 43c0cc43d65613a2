"""`sglang`: SGLang on CUDA. `profile.SglangProfile` is the profile; `layout` plans pools, index maps
and windows for every layer kind, with `archs`, `pools`, `swa`, `refusals` and `sizing` beside it;
`budget` sizes the pools; `dryrun` and `startup` run SGLang's own start-up in a child; `probe` and
`probe_child` build SGLang's pool classes; `kda/` holds the KDA ReplaySSM state caches."""
