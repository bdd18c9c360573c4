-- heartbeat(run, ttl, grace, epoch, myver, pttl, w1, w2, ...): renews each
-- worker's lease if it has not run out (Redis time), reaps members whose
-- lease ran out more than grace ago (their jobs become orphans).
-- -> {ver, generation, shut, learn_remaining_ms, due, renewed..., [slots...]}
-- renewed_i is 1 or 0; the slots follow only if ver differs from myver.
-- An empty epoch: do not re-create a missing pool (this node saw it shut
-- down); the answer then says shut 2, or 3 if it was shut down for good.
local ttl, grace = tonumber(ARGV[2]), tonumber(ARGV[3])
if not ensure(ttl, grace, ARGV[4], '', tonumber(ARGV[6])) then
  local out = {0, '', shut_down() and 3 or 2, 0, 0}
  for i = 7, #ARGV do out[#out + 1] = 0 end
  return out
end
reap(grace)
local ws = {}
for i = 7, #ARGV do
  local w = ARGV[i]
  if is_live(w) then
    redis.call('ZADD', P .. 'members', NOW + ttl, w)
    ws[#ws + 1] = 1
  else
    ws[#ws + 1] = 0
  end
end
local due = 0
if not learning() then
  due = redis.call('ZCOUNT', P .. 'pending', '-inf', fmt(NOW))
end
local ver = mnum('ver')
local out = {ver, generation(), mnum('shut'), math.max(0, mnum('learn') - NOW), due}
for _, x in ipairs(ws) do out[#out + 1] = x end
if fmt(ver) ~= ARGV[5] then
  for _, s in ipairs(slots()) do out[#out + 1] = s end
end
return out
