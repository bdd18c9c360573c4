-- init(capacity, ttl_ms, grace_ms, new_epoch, fresh, run_id, test, debug_now, cap_ver)
-- The capacity is a versioned setting: it replaces the budget's only if its
-- version is higher, so a node configured with an older capacity never
-- overrides the fleet's (a deliberate change bumps the version).
local cap, ttl, grace = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cap_ver = tonumber(ARGV[9])
if redis.call('EXISTS', meta) == 1 then
  redis.call('HSET', meta, 'ttl', fmt(ttl), 'grace', fmt(grace))
  if cap_ver > (num(redis.call('HGET', meta, 'cap_ver')) or 0) then
    redis.call('HSET', meta, 'capacity', fmt(cap), 'cap_ver', fmt(cap_ver))
  end
  redis.call('HDEL', meta, 'fair_at') -- the cached fair-share sums are stale
  return {'EXISTS', redis.call('HGET', meta, 'epoch')}
end
if ARGV[7] == '1' then
  redis.call('HSET', meta, 'test', '1')
  if ARGV[8] ~= '' then redis.call('HSET', meta, 'debug_now', ARGV[8]) end
end
local now = clock()
local learn_until = 0
if ARGV[5] ~= '1' then learn_until = now + ttl + grace end
redis.call('HSET', meta, 'capacity', fmt(cap), 'cap_ver', fmt(cap_ver), 'ttl', fmt(ttl),
  'grace', fmt(grace), 'epoch', ARGV[4], 'granted', '0', 'seq', '0',
  'learn_until', fmt(learn_until), 'run_id', ARGV[6], 'losses', '0', 'format', '1')
return {'CREATED', ARGV[4]}
