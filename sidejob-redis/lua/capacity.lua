-- set_capacity(capacity): an admin's deliberate change of the fleet capacity.
-- The new setting's version is one above the budget's, so no node configured
-- with an older setting overrides it, and nodes that learned it restore it
-- after a state loss. Leaves run_id alone: a restart is still seen by the
-- next renewal. A lowered capacity needs nothing more here: renew grows no
-- grant while granted > capacity and asks every node above its share of the
-- new capacity to shrink to it.
if redis.call('EXISTS', meta) == 0 then return {'NOBUDGET'} end
local cap = tonumber(ARGV[1])
local ver = (num(redis.call('HGET', meta, 'cap_ver')) or 0) + 1
redis.call('HSET', meta, 'capacity', fmt(cap), 'cap_ver', fmt(ver))
redis.call('HDEL', meta, 'fair_at') -- the cached fair-share sums are stale
return {'OK', cap, ver}
