-- stop(run, ttl, grace, key): the job is no longer wanted. Not started
-- yet: forgotten at once. Running: its owner is asked to stop it.
-- -> {'OK'} | {'NOTFOUND'} | {'NOPOOL'} | {'CLOSED'}
if redis.call('EXISTS', META) == 0 then return {shut_down() and 'CLOSED' or 'NOPOOL'} end
ensure(tonumber(ARGV[2]), tonumber(ARGV[3]), '')
local k = ARGV[4]
local had = redis.call('HDEL', P .. 'jobs', k)
local st = redis.call('HGET', P .. 'st', k)
if st == 'P' then
  drop_record(k)
elseif st == 'S' and had == 1 then
  -- dispatched again while stopping, and now stopped again: not queued
  redis.call('SREM', P .. 'again', k)
elseif st == 'R' then
  redis.call('HSET', P .. 'st', k, 'S')
  send(redis.call('HGET', P .. 'own', k), {'t', 'x', 'k', k, 'tok', redis.call('HGET', P .. 'tok', k)})
elseif had == 0 then
  return {'NOTFOUND'}
end
return {'OK'}
