#!/bin/bash
echo done > /app/out.txt
