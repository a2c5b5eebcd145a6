-- ARGV: prefix, now, queue, band, attempts, due, json: one job (a single dispatch).
-- needs: push_lib
push(ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[2]), {})
wake(ARGV[1])
return 1
