-- init(capacity, ttl_ms, grace_ms, new_epoch, fresh, run_id, test, debug_now)
local cap, ttl, grace = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('EXISTS', meta) == 1 then
  redis.call('HSET', meta, 'capacity', fmt(cap), 'ttl', fmt(ttl), 'grace', fmt(grace))
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
redis.call('HSET', meta, 'capacity', fmt(cap), 'ttl', fmt(ttl), 'grace', fmt(grace),
  'epoch', ARGV[4], 'granted', '0', 'seq', '0', 'learn_until', fmt(learn_until),
  'run_id', ARGV[6], 'losses', '0', 'format', '1')
return {'CREATED', ARGV[4]}
