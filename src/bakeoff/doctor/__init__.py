"""``bakeoff doctor``: the host, the model and the images checked before any pull or server start.

- :mod:`~bakeoff.doctor.problems`: one problem, one line (the field, what the framework would have
  done, the fix), and whether it stops a run.
- :mod:`~bakeoff.doctor.host`: the host's own outputs (``nvidia-smi``, the runtimes' ``info``, CDI
  specs, limits, disk), read live, recorded to a folder, or read back from one.
- :mod:`~bakeoff.doctor.host_checks`: the runtime that can hand over GPUs and the flags it takes,
  the driver against each image's CUDA, compute capability against the knobs, GPU memory, disk.
- :mod:`~bakeoff.doctor.model_checks`: the checkpoint's context against ``max_model_len``, a chat
  template where chat is used, one tokenizer for every server.
- :mod:`~bakeoff.doctor.image_checks`: fully qualified image names, well-formed digests.
- :mod:`~bakeoff.doctor.diagnose`: every check over a campaign's servers (:class:`DoctorServer`).

The campaign side (which servers, knobs and model folders a campaign asks for) is
:mod:`bakeoff.campaign.doctor_run`; this package reads no campaign file itself.
"""
