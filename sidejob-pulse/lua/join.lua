-- join(run, ttl, grace, epoch, reopen, fresh, pttl): a node joins;
-- creates the pool if missing, unless it was shut down (reopen "1": the
-- user re-creates it on purpose, and the tombstone goes). fresh "1": a
-- pool this join creates does not learn for Redis' young age (see ensure).
-- -> {shut, ver, generation, learn_remaining_ms, pool_ttl_ms,
--     pool_grace_ms, pool_pttl_ms, slots...}
-- shut 3: the pool was shut down (nothing created). A timing 0: a pool
-- created before that timing was recorded.
if ARGV[5] == '1' then redis.call('DEL', P .. 'closed') end
if not ensure(tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[6], tonumber(ARGV[7])) then
  return {3, 0, '', 0, 0, 0, 0}
end
local out = {mnum('shut'), mnum('ver'), generation(), math.max(0, mnum('learn') - NOW),
  mnum('ttl'), mnum('grace'), mnum('pttl')}
for _, s in ipairs(slots()) do out[#out + 1] = s end
return out
