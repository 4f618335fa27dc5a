/*
 * The runtime's exit statuses the plugin tells apart beyond 0 and 1
 * (any other failure), one BERTH_STATUS_<NAME> a line: written by
 * scripts/answer_keys.py from their one table,
 * runtime/berth/porcelain.py's STATUSES (do not edit).
 */
#ifndef BERTH_SPANK_ANSWER_STATUS_H
#define BERTH_SPANK_ANSWER_STATUS_H
/* import --resolve failed for a reason asking again will not mend (errors.Permanent: no such host, no such image, access refused) */
#define BERTH_STATUS_PERMANENT 3
#endif
