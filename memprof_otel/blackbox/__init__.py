"""The black box: a small memory-mapped file per process that a SIGKILL (the kernel's OOM killer,
a container's memory limit) cannot erase, and the post-mortems the next process reads from it.

``format.py`` the file format (pure), ``writer.py`` this process's file (written in place),
``kernel.py`` what the kernel says (identity, cgroup counters, near-limit notifications, its log),
``classify.py`` why a process ended (pure), ``scan.py`` the files of processes that are gone,
``service.py`` the service the composition root wires to the sampler and the models.
"""
