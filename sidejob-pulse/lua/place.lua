-- place(run, pttl, ver, k1, tok1, owner1, ...): (re)places due jobs on the
-- owners the client computed over membership version ver. A job still
-- pending on the same owner gets its start mailed again (same token);
-- otherwise a new assignment (new token).
-- -> {'OK', placed} | {'STALE', ver, slots...} | {'WAIT'}
local pttl, ver = tonumber(ARGV[2]), ARGV[3]
if redis.call('EXISTS', META) == 0 then return {'OK', 0} end
if mget('ver') ~= ver then
  local out = {'STALE', mnum('ver')}
  for _, s in ipairs(slots()) do out[#out + 1] = s end
  return out
end
if learning() then return {'WAIT'} end
local n = 0
for i = 4, #ARGV, 3 do
  local k, t, w = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local due = redis.call('ZSCORE', P .. 'pending', k)
  if due and tonumber(due) <= NOW and redis.call('HGET', P .. 'st', k) == 'P'
      and redis.call('HGET', P .. 'tok', k) == t then
    local cur = redis.call('HGET', P .. 'own', k)
    if cur == w and w ~= '' then
      redis.call('ZADD', P .. 'pending', NOW + pttl, k)
      send(w, {'t', 's', 'k', k, 'tok', t, 'p', redis.call('HGET', P .. 'jobs', k)})
    else
      assign(k, w, pttl)
    end
    n = n + 1
  end
end
return {'OK', n}
