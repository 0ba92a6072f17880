"""One probe = one fresh process tree: preflight (:mod:`.preflight`), launch, wait and record (:mod:`.probe`),
and ending the tree with everything it started (:mod:`.procs`)."""
