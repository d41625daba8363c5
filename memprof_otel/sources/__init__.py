"""Memory sources: each reads one allocator, device or kernel figure behind the small interface of
``base.py``; the registry creates them on first use and shares them. ``ledger.py`` and
``torch_compat.py`` import torch, the CUDA sources only once asked about a CUDA device;
``tensorflow.py`` and ``jax_memory.py`` import their framework; the others import none.

``base.py`` the interface every source implements
``cgroup.py`` the process's cgroup: usage, working set, limit, OOM kills, CPU quota, memory events, PSI
``cgroup_files.py`` the kernel's cgroup files (v1 and v2) parsed: pure, no I/O
``cuda.py`` torch's CUDA caching allocator on one device
``cuda_history.py`` the CUDA allocator's history, recorded only inside a deep capture
``cuda_stats.py`` pure figures over the CUDA allocator's stats (no torch import)
``cuda_trace.py`` the CUDA allocator's trace, armed only while attributed forwards run
``glibc.py`` the host heap (glibc malloc) through ``mallinfo2()``, self-timed and backed off
``in_flight_levels.py`` the level each device's allocator was at when the forwards in flight began
``jax_memory.py`` JAX's device figures, the counter a Keras-on-JAX forward reads
``ledger.py`` the exact tensor ledger: live storage bytes of one thread's attributed forward
``mmap_threshold.py`` glibc's mmap threshold, fixed so a CPU forward's resident size follows its tensors
``nvml.py`` NVML: device-wide GPU memory and this process's share, as the driver reports it
``nvml_mig.py`` the MIG devices of one GPU, as NVML enumerates them
``process.py`` the process from /proc: RSS, virtual size, peak, limit, children, CPU time, disk I/O
``process_hwm.py`` the kernel's figure of a forward: how far it raised the resident high-water mark
``process_visibility.py`` whether NVML can see this process (not from inside a PID namespace; pure)
``python_heap.py`` the Python object heap: pymalloc's pools in use, from CPython's arena statistics
``read_backoff.py`` how often an expensive read may run (``glibc.py``'s, ``python_heap.py``'s)
``registry.py`` the process-wide sources, created on first use, each with the reason it is down
``survivors.py`` the storages born in attributed forwards that outlive them, per birth layer
``tensorflow.py`` TensorFlow's allocator statistics, the counter a Keras-on-TensorFlow forward reads
``tf_cpu_statistics.py`` whether TensorFlow keeps CPU allocator statistics, and how to make it
``torch_compat.py`` the private torch names used, looked up once, each with a fallback or a reason

Public: nothing here is imported by users. What the sources read reaches them as the
``memprof_allocator_*``, ``memprof_gpu_*``, ``memprof_process_*`` and ``memprof_container_*``
families, ``memprof_source_up`` (with the reason in ``GET /v1/status``), ``GET /v1/memory`` and
``memprof-otel info``, and the ``cuda.*`` config. The module paths are internal.
"""
