-- wrk script for scripts/load.sh: prints one machine-readable line with
-- requests/s, the share refused (non-2xx), and the p50/p99 of admitted
-- requests.
--
-- wrk keeps one latency histogram for all responses. A refusal is answered
-- without running the handler (well under a millisecond), an admitted
-- request takes at least the handler's work (milliseconds), so the refused
-- responses are the fastest share `r` of the histogram and the admitted
-- ones the rest: admitted p50 = overall percentile r + 0.50 (1 - r),
-- admitted p99 = overall percentile r + 0.99 (1 - r). The script also
-- prints the overall latency just below and above `r`, so a reader can see
-- the split is clean (below: sub-millisecond; above: >= the work time).
done = function(summary, latency, requests)
  local total = summary.requests
  local refused = summary.errors.status
  local r = 0
  if total > 0 then r = refused / total end
  local function pct(p)
    if p > 100 then p = 100 end
    return latency:percentile(p) / 1000.0 -- microseconds -> ms
  end
  local secs = summary.duration / 1e6
  io.write(string.format(
    "RESULT rps=%.0f sent=%d refused=%d refused_share=%.4f admitted_p50_ms=%.2f admitted_p99_ms=%.2f below_split_ms=%.3f above_split_ms=%.3f socket_errors=%d\n",
    total / secs, total, refused, r,
    pct(100 * (r + 0.50 * (1 - r))), pct(100 * (r + 0.99 * (1 - r))),
    pct(math.max(100 * r - 0.5, 0.001)), pct(math.min(100 * r + 0.5, 100)),
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
