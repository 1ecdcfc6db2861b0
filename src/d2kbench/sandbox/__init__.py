"""OS-level isolation for untrusted code: solution workers and agent processes.

In-process monitors (:mod:`d2kbench.integrity`) can be read and rewritten by the code they
watch, so the boundary between untrusted code and the trusted parent is drawn by the kernel:

* :mod:`d2kbench.sandbox.bwrap` finds `bubblewrap <https://github.com/containers/bubblewrap>`_
  (``bwrap``), checks once per process that it can create namespaces here, and turns a
  :class:`~d2kbench.sandbox.bwrap.Policy` (what is visible read-only, what is writable, which
  devices, which environment) into a command line: new user, PID, network, IPC, UTS and
  cgroup namespaces, no capabilities, a fresh ``/proc``, ``--die-with-parent``.
* :mod:`d2kbench.sandbox.policy` builds the two policies the project needs: a solution
  worker's (the Python runtime, the harness package without the suite's held-back files, the
  task's public files, the solution's folder, one private writable directory, the GPU device
  nodes) and an agent's (its workspace and the runtime its tools need).
* :mod:`d2kbench.sandbox.process` holds the process hygiene shared by every launcher: the
  parent made non-dumpable, children in their own session that die with their parent (and,
  for a worker without a sandbox, without capabilities).
* :mod:`d2kbench.sandbox.seccomp` is the process filter an untrusted solution's CPU worker
  installs on itself before loading it: no fork, no process clone, no exec.
* :mod:`d2kbench.sandbox.channel` is how the parent reads what a worker sends: pickles loaded
  through an allow-list, and its resource-sharer listener hardened.

Where bubblewrap is missing or cannot create namespaces (a user's machine without them), the
harness says so loudly and records ``sandbox: none`` with the reason in every result's
environment (:func:`d2kbench.sandbox.bwrap.status`); ``D2K_SANDBOX=require`` turns that into
an error. What each layer defends against is in ``docs/integrity.md``.
"""
