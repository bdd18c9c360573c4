-- join(run, ttl, grace, epoch): a node joins; creates the pool if missing.
-- -> {shut, ver, generation, learn_remaining_ms, slots...}
ensure(tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4])
local out = {mnum('shut'), mnum('ver'), generation(), math.max(0, mnum('learn') - NOW)}
for _, s in ipairs(slots()) do out[#out + 1] = s end
return out
