-- due(run, limit): assignments due for (re)placement: orphans and pending
-- jobs not started within the pending-job TTL. None while learning.
-- -> {ver, learn_remaining_ms, k1, tok1, k2, tok2, ...}
local out = {mnum('ver'), math.max(0, mnum('learn') - NOW)}
if learning() or redis.call('EXISTS', META) == 0 then return out end
local ks = redis.call('ZRANGEBYSCORE', P .. 'pending', '-inf', fmt(NOW), 'LIMIT', 0, tonumber(ARGV[2]))
for _, k in ipairs(ks) do
  out[#out + 1] = k
  out[#out + 1] = redis.call('HGET', P .. 'tok', k) or '0'
end
return out
