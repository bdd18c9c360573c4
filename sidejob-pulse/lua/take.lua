-- take(run, ttl, grace, ver, wid, key, tok): worker wid claims the job it
-- was assigned, just before starting it. Idempotent.
-- -> {'OK'} | {'LOST'} | {'WAIT'} | {'STALE', ver, slots...}
if redis.call('EXISTS', META) == 0 then return {'LOST'} end
ensure(tonumber(ARGV[2]), tonumber(ARGV[3]), '')
local ver, w, k, t = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
if redis.call('HGET', P .. 'own', k) ~= w or redis.call('HGET', P .. 'tok', k) ~= t then return {'LOST'} end
local st = redis.call('HGET', P .. 'st', k)
if st == 'R' then return {'OK'} end
if st ~= 'P' or not is_live(w) or mget('shut') == '2' then return {'LOST'} end
if learning() then return {'WAIT'} end
if mget('ver') ~= ver then
  local out = {'STALE', mnum('ver')}
  for _, s in ipairs(slots()) do out[#out + 1] = s end
  return out
end
redis.call('HSET', P .. 'st', k, 'R')
redis.call('ZREM', P .. 'pending', k)
return {'OK'}
