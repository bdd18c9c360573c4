-- view(run): -> {ver, generation, shut, slots...} (ver 0: no pool)
if redis.call('EXISTS', META) == 0 then return {0, '', 0} end
local out = {mnum('ver'), generation(), mnum('shut')}
for _, s in ipairs(slots()) do out[#out + 1] = s end
return out
