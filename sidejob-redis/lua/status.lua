-- status(): read-only; capacity, granted, learning, losses and every lease.
if redis.call('EXISTS', meta) == 0 then return {'NOBUDGET'} end
local now = clock()
local m = redis.call('HMGET', meta, 'capacity', 'granted', 'learn_until', 'losses', 'epoch', 'seq',
  'cap_ver')
local nodes = {}
local members = redis.call('ZRANGE', exp, 0, -1, 'WITHSCORES')
for i = 1, #members, 2 do
  local n = members[i]
  nodes[#nodes + 1] = {n, tonumber(redis.call('HGET', held, n) or 0), tonumber(members[i + 1]),
    tonumber(redis.call('HGET', info, n .. ':want') or 0),
    tonumber(redis.call('HGET', info, n .. ':need') or 0)}
end
return {'OK', tonumber(m[1]), tonumber(m[2]), math.max(0, tonumber(m[3]) - now),
  tonumber(m[4]), m[5], tonumber(m[6]), now, nodes, tonumber(m[7] or 0)}
