-- moved(run, ttl, grace, pttl, ver, wid, key, tok, new_owner): worker wid,
-- which holds the job (and has stopped it, if it ran), hands it to the
-- owner computed over membership version ver.
-- -> {'OK'} | {'LOST'} | {'STALE', ver, slots...}
if redis.call('EXISTS', META) == 0 then return {'LOST'} end
ensure(tonumber(ARGV[2]), tonumber(ARGV[3]), '')
local pttl, ver, w, k, t, to = tonumber(ARGV[4]), ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
if redis.call('HGET', P .. 'own', k) ~= w or redis.call('HGET', P .. 'tok', k) ~= t then return {'LOST'} end
if redis.call('HEXISTS', P .. 'jobs', k) == 0 then
  drop_record(k)
  return {'OK'}
end
if mget('ver') ~= ver then
  local out = {'STALE', mnum('ver')}
  for _, s in ipairs(slots()) do out[#out + 1] = s end
  return out
end
assign(k, to, pttl)
return {'OK'}
