-- renew(node, req, epoch_seen, ver_seen, has, need, want, run_id, capacity, cap_ver)
-- Heartbeat, grow and shrink in one atomic step (CLUSTER.md section 2.4).
if redis.call('EXISTS', meta) == 0 then return {'NOBUDGET'} end
local now = clock()
local node = ARGV[1]
local req, epoch_seen, ver_seen = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local has, need, want = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local run_id = ARGV[8]
local m = redis.call('HMGET', meta, 'capacity', 'ttl', 'grace', 'epoch', 'granted', 'seq',
  'learn_until', 'run_id', 'losses', 'cap_ver')
local cap, ttl, grace, epoch = tonumber(m[1]), tonumber(m[2]), tonumber(m[3]), m[4]
local granted, seq, learn_until = tonumber(m[5]), tonumber(m[6]), tonumber(m[7])
local losses = tonumber(m[9])
local cap_ver = num(m[10]) or 0

-- 1b. The capacity setting the node knows (configured or learned) replaces
-- the budget's only if its version is higher: an older configuration never
-- overrides the fleet's, and a budget re-created after a state loss by a
-- node that knew less gets the fleet's setting back.
if tonumber(ARGV[10]) > cap_ver then
  cap, cap_ver = tonumber(ARGV[9]), tonumber(ARGV[10])
  redis.call('HSET', meta, 'capacity', fmt(cap), 'cap_ver', fmt(cap_ver))
  redis.call('HDEL', meta, 'fair_at') -- the cached fair-share sums are stale
end

-- Learning mode: no grant grows until every forgotten holder has drained.
local function lose()
  if now + ttl + grace > learn_until then learn_until = now + ttl + grace end
  losses = losses + 1
end
local function save_meta()
  redis.call('HSET', meta, 'granted', fmt(granted), 'seq', fmt(seq),
    'learn_until', fmt(learn_until), 'run_id', run_id, 'losses', fmt(losses))
end

-- 2. Identity: another Redis process wrote last (restart, failover).
if run_id ~= m[8] then lose() end

-- 3. Reap leases lapsed for longer than the grace.
local lapsed = redis.call('ZRANGEBYSCORE', exp, '-inf', fmt(now - grace), 'LIMIT', 0, 100)
for _, n in ipairs(lapsed) do
  granted = granted - (num(redis.call('HGET', held, n)) or 0)
  forget(n)
end

local rec = num(redis.call('HGET', held, node))
local ver = num(redis.call('HGET', info, node .. ':ver')) or 0

-- 4. Deduplicate: an old or repeated request changes nothing.
if req <= (num(redis.call('HGET', info, node .. ':req')) or 0) then
  save_meta()
  return {'STALE', rec or 0, ttl, ver, epoch, -1, math.max(0, learn_until - now), now, -1,
    cap, cap_ver}
end

-- 5. The store forgot something this node holds.
if has > 0 and (epoch_seen ~= epoch or rec == nil or ver_seen > ver) then lose() end

-- 6. Re-adopt (never more than it has, never more than is free), 7. shrink.
local g = rec or 0
if rec == nil and has > 0 then
  g = math.min(has, math.max(cap - granted, 0))
  granted = granted + g
end
if has < g then
  granted = granted - (g - has)
  g = has
end

-- Fair share. Overloaded (needs above C): each node is guaranteed its need
-- up to an equal share, and the rest goes in proportion to the need beyond
-- that (as a global semaphore would split an overload). Otherwise: its need
-- plus the leftover in proportion to need.
-- The sums over every node (count, total need, guaranteed part) are cached
-- in meta for T/10 (R/2 at the defaults); in between, a renewal only swaps
-- its own old need for its new one, so a renew stays O(log N).
local f = redis.call('HMGET', meta, 'fair_at', 'fair_k', 'fair_total', 'fair_base')
local fair_at, k, total, base = num(f[1]), num(f[2]), num(f[3]), num(f[4])
if fair_at == nil or now < fair_at or now >= fair_at + math.floor(ttl / 10) then
  -- One HMGET per 1000 nodes rather than one HGET per node.
  local needs = {need}
  local fields = {}
  for _, n in ipairs(redis.call('ZRANGE', exp, 0, -1)) do
    if n ~= node then fields[#fields + 1] = n .. ':need' end
  end
  for i = 1, #fields, 1000 do
    local vals = redis.call('HMGET', info, unpack(fields, i, math.min(i + 999, #fields)))
    for _, v in ipairs(vals) do needs[#needs + 1] = num(v) or 0 end
  end
  k, total, base = #needs, 0, 0
  local eq = math.floor(cap / k)
  for i = 1, k do
    total = total + needs[i]
    base = base + math.min(needs[i], eq)
  end
  fair_at = now
else
  local old = num(redis.call('HGET', info, node .. ':need'))
  local eq = math.floor(cap / k)
  if old == nil or rec == nil then
    k = k + 1
    old = 0
  end
  total = total - old + need
  base = base - math.min(old, eq) + math.min(need, eq)
end
redis.call('HSET', meta, 'fair_at', fmt(fair_at), 'fair_k', fmt(k), 'fair_total', fmt(total),
  'fair_base', fmt(base))
local equal = math.floor(cap / k)
local fair
if total > cap then
  local mine = math.min(need, equal)
  fair = mine + math.floor(math.max(cap - base, 0) * (need - mine) / math.max(total - base, 1))
elseif total > 0 then
  fair = need + math.floor((cap - total) * need / total)
else
  fair = equal
end

-- 8. Grow only from free capacity, only outside learning mode, and only up
-- to the fair share while another node is starved.
local others = redis.call('ZCOUNT', starve, '(' .. fmt(now), '+inf')
local mine = num(redis.call('ZSCORE', starve, node))
if mine and mine > now then others = others - 1 end
if now >= learn_until and want > g and granted < cap then
  local limit = want
  if others > 0 then limit = math.min(want, math.max(g, fair)) end
  local add = math.min(limit - g, cap - granted)
  if add > 0 then
    g = g + add
    granted = granted + add
  end
end

-- 9. Starvation and shrink targets. While the fleet holds more than the
-- capacity (it was lowered), every node above its fair share is asked down
-- to it, without the 10 % hysteresis: the fair shares sum to at most the
-- capacity, so the grants come down to it.
if want > g then
  redis.call('ZADD', starve, fmt(now + ttl), node)
else
  redis.call('ZREM', starve, node)
end
local target = -1
if granted > cap and g > fair then
  target = fair
elseif others > 0 and g * 10 > fair * 11 then
  target = fair
end

-- 10. Record, 11. answer.
seq = seq + 1
redis.call('HSET', held, node, fmt(g))
redis.call('ZADD', exp, fmt(now + ttl), node)
redis.call('HSET', info, node .. ':want', fmt(want), node .. ':need', fmt(need),
  node .. ':ver', fmt(seq), node .. ':req', fmt(req))
save_meta()
-- When the earliest other lease can be reaped (its expiry + G), so that a
-- node held below what it wants can renew right then rather than up to a
-- renew period later. O(log N): the two first members of the TTL index.
local reap_in = -1
local first = redis.call('ZRANGE', exp, 0, 1, 'WITHSCORES')
for i = 1, #first, 2 do
  if first[i] ~= node then
    reap_in = math.max(0, tonumber(first[i + 1]) + grace - now)
    break
  end
end
return {'OK', g, ttl, seq, epoch, target, math.max(0, learn_until - now), now, reap_in,
  cap, cap_ver}
