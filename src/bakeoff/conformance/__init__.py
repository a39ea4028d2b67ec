"""Release conformance: a backend's launch held against the framework release it targets.

- :mod:`~bakeoff.conformance.preflight`: the exact rendered launch parsed by the framework's own
  parser in its image (or engine environment) before any GPU time; a stand-in in a rehearsal.
- :mod:`~bakeoff.conformance.audit`: ``bakeoff backends audit``, a backend YAML against the
  framework's released wheel (flags, choices, config keys, defaults, metric names, endpoints).
- :mod:`~bakeoff.conformance.wheel_scan`: what a wheel declares about itself, read statically.

The campaign side (which servers a campaign checks, refusing a run on a refusal) is
:mod:`bakeoff.campaign.preflight_cells`. A maintainer's tool and a run's first check, kept out
of :mod:`bakeoff.serving`, which starts, watches and stops servers.
May import: ``serving``, ``measure``, ``models``, ``workloads``, ``results`` and the leaves.
"""
