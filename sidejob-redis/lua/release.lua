-- release(node, req): a clean shutdown gives the node's grant back at once.
if redis.call('EXISTS', meta) == 0 then return 0 end
local node, req = ARGV[1], tonumber(ARGV[2])
local rec = num(redis.call('HGET', held, node))
if rec == nil then return 0 end
if req <= (num(redis.call('HGET', info, node .. ':req')) or 0) then return 0 end
local granted = tonumber(redis.call('HGET', meta, 'granted')) - rec
forget(node)
redis.call('HSET', meta, 'granted', fmt(granted))
return rec
