"""The registry of datasets this package knows by name: where each file comes from, how to read and cite it.

The SHA-256 digests of the GroupLens archives are those TensorFlow Datasets records for the same URLs
(tensorflow_datasets/url_checksums/movielens.txt), so a changed or truncated download is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

_GROUPLENS = "https://files.grouplens.org/datasets/movielens"
_MOVIELENS = 'F. M. Harper, J. A. Konstan, "The MovieLens Datasets: History and Context", ACM TiiS 2015.'


@dataclass(frozen=True)
class DatasetInfo:
    """A dataset of the paper: where its file comes from and how to read and cite it."""

    name: str
    fmt: str  # default format for its file
    description: str
    citation: str
    url: str | None  # public download URL, None if none exists
    filename: str  # the file inside the download to read
    bundled: bool
    authors_fmt: str | None = None  # the format data.protocol = "authors" reads, when it differs from fmt
    sha256: str | None = None  # the download's SHA-256, when known: `data fetch` refuses any other bytes


_TENREC_APPLICATION = "https://static.qblv.qq.com/qblv/h5/algo-frontend/tenrec_dataset.html"

DATASETS: dict[str, DatasetInfo] = {
    info.name: info
    for info in [
        DatasetInfo(
            name="filmtrust",
            fmt="filmtrust",
            description="FilmTrust movie ratings: 35,497 ratings of 2,071 films by 1,508 users (bundled).",
            citation=(
                'G. Guo, J. Zhang, N. Yorke-Smith, "A Novel Bayesian Similarity Measure for '
                'Recommender Systems", IJCAI 2013.'
            ),
            url="https://guoguibing.github.io/librec/datasets/filmtrust.zip",
            filename="ratings.txt",
            bundled=True,
        ),
        DatasetInfo(
            name="lastfm-2k",
            fmt="lastfm-hetrec",
            description="Last.fm artist listening of 1,892 users over 17,632 artists (HetRec 2011).",
            citation=(
                'I. Cantador, P. Brusilovsky, T. Kuflik, "2nd Workshop on Information Heterogeneity '
                'and Fusion in Recommender Systems (HetRec 2011)", RecSys 2011.'
            ),
            url="https://files.grouplens.org/datasets/hetrec2011/hetrec2011-lastfm-2k.zip",
            filename="user_artists.dat",
            bundled=False,
            # The authors read a 4-column file with timestamps (user, item, weight, timestamp).
            authors_fmt="lastfm-ts",
        ),
        DatasetInfo(
            name="amazon-video",
            fmt="amazon",
            description=(
                "Amazon Instant Video ratings (ratings-only CSV); the paper keeps 8,072 users, "
                "11,830 items, 63,836 interactions."
            ),
            citation=(
                'R. He, J. McAuley, "Ups and Downs: Modeling the Visual Evolution of Fashion Trends '
                'with One-Class Collaborative Filtering", WWW 2016; J. McAuley, C. Targett, Q. Shi, '
                'A. van den Hengel, "Image-based Recommendations on Styles and Substitutes", SIGIR 2015.'
            ),
            url="http://snap.stanford.edu/data/amazon/productGraph/categoryFiles/ratings_Amazon_Instant_Video.csv",
            filename="ratings_Amazon_Instant_Video.csv",
            bundled=False,
        ),
        DatasetInfo(
            name="qb-article",
            fmt="tenrec",
            description=(
                "QQ Browser article clicks from Tenrec; the paper keeps 24,508 users, 7,352 items, "
                "348,704 interactions. There is no public download: Tenrec is released on "
                f"application at {_TENREC_APPLICATION}."
            ),
            citation=(
                'G. Yuan et al., "Tenrec: A Large-scale Multipurpose Benchmark Dataset for '
                'Recommender Systems", NeurIPS 2022 Datasets and Benchmarks.'
            ),
            url=None,
            filename="QB-article.csv",
            bundled=False,
        ),
        DatasetInfo(
            name="ml-100k",
            fmt="ml-100k",
            description=(
                "MovieLens-100K: 100,000 ratings of 1,682 movies by 943 users; read from an "
                "installed recbole (pip install --no-deps recbole==1.2.1) or from a u.data."
            ),
            citation=_MOVIELENS,
            url=f"{_GROUPLENS}/ml-100k.zip",
            filename="ml-100k/u.data",
            bundled=False,
            sha256="50d2a982c66986937beb9ffb3aa76efe955bf3d5c6b761f4e3a7cd717c6a3229",
        ),
        DatasetInfo(
            name="ml-1m",
            fmt="ml-1m",
            description="MovieLens-1M: 1,000,209 ratings of 3,706 movies by 6,040 users (ratings.dat, '::'-separated).",
            citation=_MOVIELENS,
            url=f"{_GROUPLENS}/ml-1m.zip",
            filename="ml-1m/ratings.dat",
            bundled=False,
            sha256="a6898adb50b9ca05aa231689da44c217cb524e7ebd39d264c56e2832f2c54e20",
        ),
        DatasetInfo(
            name="ml-20m",
            fmt="ml-20m",
            description="MovieLens-20M: 20,000,263 ratings of 26,744 movies by 138,493 users (ratings.csv).",
            citation=_MOVIELENS,
            url=f"{_GROUPLENS}/ml-20m.zip",
            filename="ml-20m/ratings.csv",
            bundled=False,
            sha256="96f243c338a8665f6bcc89c53edf6ee39162a846940de6b7c8c48aeada765ff3",
        ),
        DatasetInfo(
            name="ml-25m",
            fmt="ml-20m",  # the same ratings.csv layout as ML-20M
            description="MovieLens-25M: 25,000,095 ratings of 59,047 movies by 162,541 users (ratings.csv).",
            citation=_MOVIELENS,
            url=f"{_GROUPLENS}/ml-25m.zip",
            filename="ml-25m/ratings.csv",
            bundled=False,
            sha256="8b21cfb7eb1706b4ec0aac894368d90acf26ebdfb6aced3ebd4ad5bd1eb9c6aa",
        ),
    ]
}
