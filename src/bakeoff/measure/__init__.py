"""The client side: one streaming request, load shapes, the measured window, summaries, SLOs.

Owns the HTTP/1.1 parser and SSE reader, request headers, the streaming client and a response's stream state, the
control-plane client, closed/open/session load generators (one process or several), the
steady-state window, run summaries from records, and SLO judging.
May import: ``workloads``, ``results`` and the leaves.
"""
