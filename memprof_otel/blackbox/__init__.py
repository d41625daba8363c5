"""The black box: a small memory-mapped file per process that a SIGKILL (the kernel's OOM killer,
a container's memory limit) cannot erase, and the post-mortems the next process reads from it.

``classify.py`` why a process ended, with the evidence that decided it (pure)
``oom_figures.py`` the figures of an OOM kill's cause, read from the dead process's file alone (pure)
``format.py`` the file format: encoding and decoding (pure)
``history.py`` the service's post-mortems on disk, served alike by every process of the service
``kernel.py`` what the kernel says (identity, cgroup counters, near-limit notifications, its log)
``scan.py`` the files of processes that are gone
``service.py`` the service the composition root wires to the sampler and the models
``signals.py`` the stop signals this process handled: a graceful stop told from a kill
``writer.py`` this process's file: created once, memory-mapped, written in place

Public: ``GET /v1/postmortem``, ``memprof-otel postmortem``, the ``postmortem`` dumps, the
``memprof_postmortems_total`` family, the post-mortem OTel events and the ``blackbox.*`` config
(docs/reference.md, Post-mortems). The module paths are internal.
"""
