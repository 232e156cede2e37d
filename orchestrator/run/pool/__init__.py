"""The pool's side of a run: the loop, one supervisor per GPU, admission by bytes, and the trial processes it starts and watches."""
