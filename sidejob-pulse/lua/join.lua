-- join(run, ttl, grace, epoch): a node joins; creates the pool if missing.
-- -> {shut, ver, generation, learn_remaining_ms, pool_ttl_ms, slots...}
-- (pool_ttl_ms 0: a pool created before the TTL was recorded)
ensure(tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4])
local out = {mnum('shut'), mnum('ver'), generation(), math.max(0, mnum('learn') - NOW), mnum('ttl')}
for _, s in ipairs(slots()) do out[#out + 1] = s end
return out
