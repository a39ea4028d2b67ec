"""What is sent: workload kinds, the request plans they make, token-exact prompts, traces.

Owns the kinds a campaign can run (:mod:`.kinds` on :mod:`.base`), lengths (:mod:`.lengths`),
plan data and the builder (:mod:`.plans`), plans on disk (:mod:`.plan_store`), prompts
(:mod:`.prompts`) and production-trace replay (:mod:`.traces`).
May import: ``results`` and the leaves.
"""
