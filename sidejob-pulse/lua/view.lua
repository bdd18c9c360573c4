-- view(run): -> {ver, generation, shut, learn_remaining_ms, slots...} (ver
-- 0: no pool; shut 3 then if it was shut down, 0 if it is missing: lost by
-- Redis)
if redis.call('EXISTS', META) == 0 then return {0, '', shut_down() and 3 or 0, 0} end
local out = {mnum('ver'), generation(), mnum('shut'), math.max(0, mnum('learn') - NOW)}
for _, s in ipairs(slots()) do out[#out + 1] = s end
return out
