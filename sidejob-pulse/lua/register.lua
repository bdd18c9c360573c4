-- register(run, ttl, grace, epoch, wid, pttl): worker wid becomes a member, in
-- the first free slot (or a new one at the end), and every member hears
-- of it. -> {'OK', ver, generation, slots...} | {'SHUTDOWN'} | {'CLOSED'}
local ttl, grace, w = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[5]
if shut_down() then return {'CLOSED'} end
if not ensure(ttl, grace, ARGV[4], '', tonumber(ARGV[6])) or mnum('shut') ~= 0 then return {'SHUTDOWN'} end
redis.call('ZADD', P .. 'members', NOW + ttl, w)
if not redis.call('LPOS', P .. 'slots', w) then
  local idx = redis.call('LPOS', P .. 'slots', '')
  if idx then redis.call('LSET', P .. 'slots', idx, w) else redis.call('RPUSH', P .. 'slots', w) end
end
local v = bump_members()
local out = {'OK', v, generation()}
for _, s in ipairs(slots()) do out[#out + 1] = s end
return out
