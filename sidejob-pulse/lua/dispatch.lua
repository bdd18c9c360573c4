-- dispatch(run, ttl, grace, pttl, ver, max, key, payload, owner): records
-- the job and assigns it to owner (computed by the client over membership
-- version ver; "" if there is no worker: an orphan, placed when one joins).
-- ver "*": whatever the membership, record the job as an orphan, due at
-- once (a keeper places it): for a client whose view the membership keeps
-- outrunning.
-- -> {'OK', token, generation} | {'STALE', ver, slots...} | {'FULL'} | {'EXISTS'}
--    | {'SHUTDOWN'} | {'NOPOOL'} | {'CLOSED'}
if redis.call('EXISTS', META) == 0 then return {shut_down() and 'CLOSED' or 'NOPOOL'} end
ensure(tonumber(ARGV[2]), tonumber(ARGV[3]), '')
local pttl, ver, max, k, p, w = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]), ARGV[7], ARGV[8], ARGV[9]
if mnum('shut') ~= 0 then return {'SHUTDOWN'} end
if redis.call('HEXISTS', P .. 'jobs', k) == 1 then return {'EXISTS'} end
if queued() >= max then return {'FULL'} end
if redis.call('HGET', P .. 'st', k) == 'S' then
  -- still stopping: the new job is placed when the stop completes, and
  -- counts as queued until then
  redis.call('HSET', P .. 'jobs', k, p)
  redis.call('SADD', P .. 'again', k)
  return {'OK', 0, generation()}
end
if ver == '*' then
  w = ''
elseif mget('ver') ~= ver then
  local out = {'STALE', mnum('ver')}
  for _, s in ipairs(slots()) do out[#out + 1] = s end
  return out
end
redis.call('HSET', P .. 'jobs', k, p)
return {'OK', assign(k, w, pttl), generation()}
