"""One probe = one fresh process tree: the checks every runner shares (:mod:`.preflight`), launch, wait, timeout
and the recorded outcome (:mod:`.probe`), its log (:mod:`.output`), and ending the tree with everything it
started (:mod:`.procs`)."""
