/* `moe env`: every knob, its resolved value and where it came from; unknown MOE_* variables
 * with the closest known name; invalid values with what they accept; idle values marked. */
#include "cli.h"

#include <string.h>

static const char *const CMD = "moe env";

static const char *source_name(moe_knob_source s)
{
    return s == MOE_KNOB_API ? "flag" : s == MOE_KNOB_ENV ? "environment" : "default";
}

static void env_usage(FILE *f)
{
    fputs("usage: moe env [--json]\n"
          "\n"
          "Lists every libmoe knob (moe_options field and MOE_* environment variable): its\n"
          "resolved value, where the value came from (default, environment, flag), what it\n"
          "accepts and what it switches. Invalid values and unknown MOE_* variables (with\n"
          "the closest known name) are listed too; the exit status is then 1, since a\n"
          "context would refuse them (invalid) or ignore them (unknown). A value given\n"
          "that cannot act with the other knobs (or only under TP) is marked\n"
          "\"(inert: why)\"; the exit status stays 0.\n",
          f);
}

int cli_cmd_env(int argc, char **argv)
{
    int json = 0;
    const cli_opt opts[] = {
        {.name = "--json", .kind = CLI_FLAG, .dst = &json}, /* one JSON document on stdout */
    };
    const int prc = cli_parse_opts(argc, argv, CMD, opts, CLI_NOPTS(opts), env_usage);
    if (prc != CLI_GO_ON)
        return prc;
    int bad = 0;
    size_t n = moe_knob_count();
    if (json)
        printf("{\"knobs\": [");
    else
        printf("%-22s %-14s %-12s %s\n", "variable", "value", "source", "accepts / switches");
    for (size_t i = 0; i < n; i++) {
        moe_knob_info k;
        if (moe_knob_describe(NULL, i, &k) != MOE_OK)
            continue;
        if (k.error[0])
            bad = 1;
        if (json) {
            printf("%s\n  {\"env\": ", i ? "," : "");
            cli_json_string(stdout, k.env);
            printf(", \"field\": ");
            cli_json_string(stdout, k.field);
            printf(", \"value\": ");
            cli_json_string(stdout, k.value);
            printf(", \"source\": ");
            cli_json_string(stdout, source_name(k.source));
            printf(", \"accepted\": ");
            cli_json_string(stdout, k.accepted);
            printf(", \"error\": ");
            cli_json_string(stdout, k.error);
            printf(", \"inert\": ");
            cli_json_string(stdout, k.inert);
            printf("}");
        } else if (k.error[0]) {
            printf("%-22s %-14s %-12s ERROR: %s\n", k.env, "(invalid)", source_name(k.source), k.error);
        } else {
            printf("%-22s %-14s %-12s %s: %s", k.env, k.value[0] ? k.value : "(none)", source_name(k.source),
                   k.accepted, k.doc);
            if (k.inert[0]) /* a given value that cannot act (moe.h "Idle knobs") */
                printf(" (inert: %s)", k.inert);
            printf("\n");
        }
    }
    const char *name, *sugg;
    size_t len;
    if (json)
        printf("\n], \"unknown\": [");
    for (size_t i = 0; moe_env_unknown(i, &name, &len, &sugg); i++) {
        bad = 1;
        char nm[128];
        snprintf(nm, sizeof nm, "%.*s", (int)(len < 127 ? len : 127), name);
        if (json) {
            printf("%s{\"name\": ", i ? ", " : "");
            cli_json_string(stdout, nm);
            printf(", \"did_you_mean\": ");
            if (sugg)
                cli_json_string(stdout, sugg);
            else
                printf("null");
            printf("}");
        } else {
            if (sugg)
                printf("%-22s %-14s %-12s WARNING: unknown variable, ignored; did you mean %s?\n", nm, "",
                       "environment", sugg);
            else
                printf("%-22s %-14s %-12s WARNING: unknown variable, ignored; no known variable is close to it\n",
                       nm, "", "environment");
        }
    }
    if (json)
        printf("]}\n");
    return bad ? CLI_FAIL : CLI_OK;
}
