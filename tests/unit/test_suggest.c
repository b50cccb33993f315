/* moe_suggest (moe.h), the one "did you mean" of the library and the tool: the distance it
 * stands on (insert, delete, substitute, swap of neighbours; case-blind) against a plain
 * dynamic-programming reference over every pair of a word list, the threshold of a third of
 * the length, prefixes, ties and the refusals. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "moe.h"

/* The reference: the full (la + 1) x (lb + 1) table of the optimal string alignment distance,
 * written from its definition. */
static size_t ref_distance(const char *a, const char *b)
{
    const size_t la = strlen(a), lb = strlen(b);
    size_t t[40][40];
    assert_true(la < 40 && lb < 40);
    for (size_t i = 0; i <= la; i++)
        for (size_t j = 0; j <= lb; j++) {
            if (i == 0 || j == 0) {
                t[i][j] = i + j;
                continue;
            }
            const int same = tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 1]);
            size_t v = t[i - 1][j - 1] + (same ? 0 : 1);
            if (t[i - 1][j] + 1 < v)
                v = t[i - 1][j] + 1;
            if (t[i][j - 1] + 1 < v)
                v = t[i][j - 1] + 1;
            if (i > 1 && j > 1 && tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == tolower((unsigned char)b[j - 1]) && t[i - 2][j - 2] + 1 < v)
                v = t[i - 2][j - 2] + 1;
            t[i][j] = v;
        }
    return t[la][lb];
}

static size_t letters(const char *s)
{
    while (*s == '-')
        s++;
    return strlen(s);
}

static int starts(const char *word, const char *c)
{
    for (; *word; word++, c++)
        if (tolower((unsigned char)*word) != tolower((unsigned char)*c))
            return 0;
    return 1;
}

/* For every word against each single candidate: suggested exactly when the reference
 * distance (or the prefix rule) is within max(1, letters / 3). */
static void test_rule_against_reference(void **state)
{
    (void)state;
    static const char *const words[] = {
        "--help", "--hlep", "--checkpoint", "--checkpont", "--chekcpoint", "run", "rnu", "bench", "bnech", "plan",
        "quantize", "qunatize", "env", "vne", "qwen3.5-35b", "qwen3.5-35b-a3b", "mixtral-8x7b", "mixtral",
        "int4-g128", "int4-g218", "int5", "fp8-block", "fp9-blok", "MOE_CHUNKSIZE", "MOE_CHUNK_SIZE", "MOE_TOPK",
        "MOE_FOO", "x", "ab", "HELP", "--Help", "--tokens", "--tokns", "frobnicate",
    };
    const size_t n = sizeof words / sizeof words[0];
    int suggested = 0, refused = 0;
    for (size_t w = 0; w < n; w++)
        for (size_t c = 0; c < n; c++) {
            const char *cand[1] = {words[c]};
            const char *got = moe_suggest(words[w], strlen(words[w]), cand, 1);
            const size_t L = letters(words[w]);
            const size_t allowed = L / 3 > 1 ? L / 3 : 1;
            size_t dist = ref_distance(words[w], words[c]);
            if (dist > 1 && L >= 3 && strlen(words[c]) > strlen(words[w]) && starts(words[w], words[c]))
                dist = 1;
            const int want = dist <= allowed;
            if ((got != NULL) != want)
                fail_msg("'%s' against '%s': distance %zu, allowed %zu, got %s", words[w], words[c], dist, allowed,
                         got ? got : "NULL");
            if (got)
                assert_ptr_equal(got, words[c]);
            suggested += want;
            refused += !want;
        }
    print_message("pairs suggested %d, refused %d\n", suggested, refused);
    assert_true(suggested > (int)n && refused > (int)n);
}

static const char *pick(const char *word, const char *const *c, size_t n)
{
    return moe_suggest(word, strlen(word), c, n);
}

/* What the messages rely on: the closest wins, the first of a tie, prefixes, NULL. */
static void test_picks(void **state)
{
    (void)state;
    static const char *const cmds[] = {"run", "bench", "plan", "quantize", "env", "version", "help", "--help",
                                       "--version"};
    const size_t nc = sizeof cmds / sizeof cmds[0];
    assert_string_equal(pick("--hlep", cmds, nc), "--help");
    assert_string_equal(pick("benhc", cmds, nc), "bench");
    assert_string_equal(pick("qunatize", cmds, nc), "quantize");
    assert_string_equal(pick("Plan", cmds, nc), "plan");
    assert_null(pick("frobnicate", cmds, nc));
    assert_null(pick("", cmds, nc));
    static const char *const models[] = {"qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3.5-35b-a3b", "mixtral-8x7b"};
    assert_string_equal(pick("qwen3.5-35b", models, 4), "qwen3.5-35b-a3b");
    assert_string_equal(pick("qwen3-30b", models, 4), "qwen3-30b-a3b");
    assert_string_equal(pick("mixtral", models, 4), "mixtral-8x7b");
    /* int4-g32 and int4-g64 are both one edit from int4-g33: the first listed wins */
    static const char *const schemes[] = {"int4-g32", "int4-g64", "int4-g128", "mxfp4", NULL};
    assert_string_equal(pick("int4-g33", schemes, 5), "int4-g32");
    assert_string_equal(pick("int4-g218", schemes, 5), "int4-g128");
    assert_string_equal(pick("mxfp5", schemes, 5), "mxfp4");
    /* the word need not be NUL-terminated (an environment entry NAME=value) */
    const char *env = "MOE_CHUNKSIZE=4";
    static const char *const knobs[] = {"MOE_NUM_THREADS", "MOE_CHUNK_SIZE", "MOE_TOPK"};
    assert_string_equal(moe_suggest(env, 13, knobs, 3), "MOE_CHUNK_SIZE");
    assert_null(moe_suggest("MOE_FOO", 7, knobs, 3));
    /* refusals */
    assert_null(moe_suggest(NULL, 3, knobs, 3));
    assert_null(moe_suggest("abc", 3, NULL, 3));
    assert_null(moe_suggest("abc", 3, knobs, 0));
    char longw[80];
    memset(longw, 'a', sizeof longw - 1);
    longw[sizeof longw - 1] = '\0';
    const char *self[1] = {longw};
    assert_null(moe_suggest(longw, strlen(longw), self, 1)); /* over 63 characters: never close */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule_against_reference),
        cmocka_unit_test(test_picks),
    };
    return cmocka_run_group_tests_name("suggest", tests, NULL, NULL);
}
