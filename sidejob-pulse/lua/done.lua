-- done(run, ttl, grace, pttl, wid, key, tok): worker wid has stopped the
-- job it was asked to stop. A job dispatched again meanwhile becomes an
-- orphan (placed by the next keeper); otherwise the record goes.
-- -> {'OK'} | {'LOST'}
if redis.call('EXISTS', META) == 0 then return {'OK'} end
ensure(tonumber(ARGV[2]), tonumber(ARGV[3]), '')
local pttl, w, k, t = tonumber(ARGV[4]), ARGV[5], ARGV[6], ARGV[7]
if redis.call('HGET', P .. 'own', k) ~= w or redis.call('HGET', P .. 'tok', k) ~= t then return {'LOST'} end
if redis.call('HEXISTS', P .. 'jobs', k) == 1 then
  assign(k, '', pttl)
else
  drop_record(k)
end
return {'OK'}
